"""runbus memory service: long-term semantic memory in Qdrant, storage scope vs search scope."""

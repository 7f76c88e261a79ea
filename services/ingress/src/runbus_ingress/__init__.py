"""The HTTP ingress: runbus over HTTP for clients that do not speak NATS — its own run API with
Server-Sent Events, OpenAI-compatible and AG-UI endpoints, an OpenAPI document and a web console.

A separate process and a plain bus client: each user's requests go over a bus connection opened
with that user's token (`runbus.client.connect`). It imports nothing of any service, and a run
it started lives on the bus, not in this process.
"""

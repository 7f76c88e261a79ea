"""Names and vector sizes of the packaged embedding models, known without loading them."""

from typing import Final

MINILM_NAME: Final = "all-MiniLM-L6-v2-int8"
MINILM_DIMENSION: Final = 384

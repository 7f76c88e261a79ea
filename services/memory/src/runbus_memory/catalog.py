"""Names and vector sizes of the packaged embedding models, known without loading them."""

from typing import Final

MINILM_NAME: Final = "all-MiniLM-L6-v2-int8"
MINILM_DIMENSION: Final = 384
USE_NAME: Final = "universal-sentence-encoder-multilingual-3"
USE_DIMENSION: Final = 512

from runbus.runner import run_service

from .service import MemoryService

run_service(MemoryService)

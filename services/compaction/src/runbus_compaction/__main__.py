from runbus.runner import run_service

from .service import CompactionService

run_service(CompactionService)

from runbus.runner import run_service

from .service import HistoryService

run_service(HistoryService)

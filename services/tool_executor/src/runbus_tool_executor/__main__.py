from runbus.runner import run_service

from .service import ToolExecutorService

run_service(ToolExecutorService)

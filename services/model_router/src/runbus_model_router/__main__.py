from runbus.runner import run_service

from .service import ModelRouterService

run_service(ModelRouterService)

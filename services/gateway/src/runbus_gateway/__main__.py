from runbus.runner import run_service

from .service import GatewayService

run_service(GatewayService)

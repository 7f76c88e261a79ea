from runbus.runner import run_service

from .service import AuthService

run_service(AuthService)

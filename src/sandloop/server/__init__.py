"""The HTTP service (``sandloop serve``): native API, SandboxFusion and OpenRLHF compatibility."""

from sandloop.server.app import create_app
from sandloop.server.auth import KeyStore, add_key, hash_token
from sandloop.server.config import ServerConfig, check_bind

__all__ = ["KeyStore", "ServerConfig", "add_key", "check_bind", "create_app", "hash_token"]

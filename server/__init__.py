"""The gitspout server: HTTP adapter, repository access, pack sources and streaming."""

from .config import Config, load_config
from .http import ServerState, make_app

__all__ = ["Config", "load_config", "ServerState", "make_app"]

"""The client's behaviour, written once as asyncio code; ``_sync/`` is generated
from it by ``client/scripts/make_sync.py``. Edit here, never in ``_sync/``."""

"""Server-side entry points: the Flower ServerApp (``server.app:app``), its strategy, deployment."""

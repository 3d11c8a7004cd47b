"""Device-side entry points: the Flower ClientApp (``clients.app:app``)."""

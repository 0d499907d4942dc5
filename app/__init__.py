"""metaledger: a metadata change service that speaks DataHub's event model."""

__version__ = "0.1.0"

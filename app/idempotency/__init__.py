"""Idempotent writes: the `Idempotency-Key` request header of the write routes (`idempotent`, app.idempotency.route),
its claims and stored replies in Postgres (app.idempotency.store)."""

from app.idempotency.route import HEADER, REPLAYED, idempotent

__all__ = ["HEADER", "REPLAYED", "idempotent"]

"""Pydantic request/response models. No fastapi or sqlalchemy imports here."""

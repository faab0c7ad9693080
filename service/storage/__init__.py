"""Persistence: engine and sessions, ORM tables, repositories (tenant id required)."""

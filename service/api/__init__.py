"""HTTP layer: thin route handlers, dependencies, middleware and problem details."""

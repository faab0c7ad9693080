"""Pure placement algorithms: numpy arrays in, numpy arrays out.

Nothing here imports the service, a web framework or a database driver, and
nothing reads files or clocks beyond what a caller passes (import-linter holds
this line in CI).
"""

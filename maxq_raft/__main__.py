"""`python -m maxq_raft` runs the server, like `maxq-server`."""

from .server.main import main

if __name__ == "__main__":
    raise SystemExit(main())

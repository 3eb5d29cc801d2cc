"""What every route stands on: connections and their deadlines, request limits and the memory
budget, API keys and TLS, the hot path that answers the busiest routes without FastAPI's
dispatch, answers' bodies and headers, metrics and the access log."""

"""Request and response bodies of the HTTP API.

The schemas check types and shapes of the JSON, strictly: ``"3"``, ``3.0`` or ``true`` is no
integer, ``"true"`` or ``1`` no boolean. Rules on values are checked in one place each:
what a request means by the model library (e.g. ``top_k`` at least 1, exactly one kind of
query), what this server allows by the data plane (e.g. ``MAX_SEARCH_TOP_K``); the schemas only
document them (``minimum``, ``maximum``) for clients.
"""

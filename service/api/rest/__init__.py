"""The service's own REST routes: ``/classify``, ``/search``, the models' listing, the live
catalogue and the admin API. Each route is thin: it reads its body, asks the data plane
(:mod:`service.api.dataplane`) and writes the answer."""

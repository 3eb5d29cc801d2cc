"""A Dask cluster and the rows on it: naming and connecting to one
(:mod:`~training.cluster.connection`), data in shards that no process loads whole
(:mod:`~training.cluster.shards`), and the rows where the workers hold them
(:mod:`~training.cluster.rows`: pieces, classes, samples; :mod:`~training.cluster.reductions`:
sums over them). Nothing here knows an estimator; without a cluster nothing imports Dask."""

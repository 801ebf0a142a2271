"""The live web console of ``gpuledger serve`` (``projections.console.app``) and the SQL
it runs over a projection (``projections.console.queries``)."""

"""Cluster Autoscaler's ``externalgrpc`` CloudProvider service, served from gpufleet.

``externalgrpc.proto`` is the wire contract; ``externalgrpc_pb2*`` are generated from it
(scripts/gen_externalgrpc.sh); ``backend.py`` is what the servicer in ``service.py`` calls.
"""

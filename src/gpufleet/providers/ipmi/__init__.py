"""The IPMI provider driver: ``IpmiProvider`` over IPMI-over-LAN through the ``ipmitool``
CLI. See ``driver.py``; the child processes are in ``client.py``, the parsers of
ipmitool's output in ``parsing.py``."""

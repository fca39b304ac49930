"""The Redfish provider: ``RedfishProvider`` drives bare-metal hosts through their BMC's
Redfish API (power, reset, one-time PXE boot). See ``driver.py``; the HTTP calls (through
``sushy``) are in ``client.py``, the readers of Redfish JSON in ``parsing.py``."""

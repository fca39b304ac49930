"""The ``ssh`` provider: static hosts reached over SSH, with no BMC (docs/providers-ssh.md)."""

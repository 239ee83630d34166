"""access: who may do what. API keys with a tenant and rights (`keys`), the identity every
call carries and the rules that decide (`rights`)."""

from layby.access.keys import DEFAULT_TENANT, Key, Keyring, KeysFileError, digest_of, parse
from layby.access.rights import (
    ADMIN,
    ANSWER,
    APPROVE,
    CANCEL,
    DEFAULT_RIGHTS,
    OPERATOR,
    READ,
    RIGHTS,
    SELF_APPROVAL,
    SELF_APPROVE,
    START,
    Identity,
)

__all__ = ["ADMIN", "ANSWER", "APPROVE", "CANCEL", "DEFAULT_RIGHTS", "DEFAULT_TENANT",
           "OPERATOR", "READ", "RIGHTS", "SELF_APPROVAL", "SELF_APPROVE", "START", "Identity",
           "Key", "Keyring", "KeysFileError", "digest_of", "parse"]

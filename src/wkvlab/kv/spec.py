"""The KV-cache configuration as data: K and V formats, round-tripping through JSON."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from wkvlab.errors import ConfigError
from wkvlab.kv.formats import KVFormat, get_kv_format


@dataclass(frozen=True)
class KVSpec:
    """Formats for keys and values (same by default).

    String form: a single format (``int4``, ``q8_0``) or ``<K fmt>/<V fmt>`` for mixed pairs
    (``q8_0/q4_0`` = keys in q8_0, values in q4_0). A slash, not a comma, so that lists of specs
    can be comma-separated on the command line.
    """

    k: str = "fp16"
    v: str = "fp16"

    def __post_init__(self) -> None:
        # Normalize aliases so equal configs compare (and hash, and fingerprint) equal.
        object.__setattr__(self, "k", get_kv_format(self.k).name)
        object.__setattr__(self, "v", get_kv_format(self.v).name)

    @property
    def k_format(self) -> KVFormat:
        return get_kv_format(self.k)

    @property
    def v_format(self) -> KVFormat:
        return get_kv_format(self.v)

    @property
    def is_identity(self) -> bool:
        return self.k_format.is_identity and self.v_format.is_identity

    @property
    def label(self) -> str:
        return self.k if self.k == self.v else f"{self.k}/{self.v}"

    def bytes_per_token(self, *, layers: int, kv_heads: int, head_dim: int) -> float:
        """Bytes one token occupies in the cache of every layer (K and V)."""
        per_head = self.k_format.bytes_per_vector(head_dim) + self.v_format.bytes_per_vector(head_dim)
        return layers * kv_heads * per_head

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "KVSpec":
        unknown = set(data) - {"k", "v"}
        if unknown:
            raise ConfigError(f"unknown KV spec field(s) {sorted(unknown)}; a KV spec has 'k' and 'v'")
        return cls(**data)

    @classmethod
    def parse(cls, text: str) -> "KVSpec":
        text = text.strip()
        if "/" in text:
            k, _, v = text.partition("/")
            if not k or not v or "/" in v:
                raise ConfigError(f"bad KV pair {text!r}; write <K format>/<V format>, e.g. q8_0/q4_0")
            return cls(k=k, v=v)
        return cls(k=text, v=text)

"""The delivery node's records as dataclasses (docs/delivery.md, docs/engine-jsonl.md).

A record is one of ``OrderState`` (``"event":"order_log"``: an order's latest state),
``Trade`` or ``OrderRejected``; an event kind this package does not know yet comes as
``OtherRecord``. Every one carries its place (``core``, ``index``, ``ord``: ``pos``), the
``firms`` involved (a trade's buyer's and seller's firm, an order's owner's twice; ``None``
where the node never saw the account or, to a firm's reader, the other firm's side is
withheld), ``ts_ns`` and ``raw``, the JSON object exactly as the node sent it (fields this
version does not name included).

Prices are integer mantissas at the instrument's price scale, quantities are lots, times
nanoseconds since the Unix epoch: no floating point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Union

__all__ = [
    "WITHHELD_ACCOUNT",
    "WITHHELD_CL_ORD_ID",
    "Fill",
    "OrderState",
    "Trade",
    "OrderRejected",
    "OtherRecord",
    "Record",
    "record_from_dict",
]

#: The account of a trade's side withheld from a firm's reader (the counterparty's).
WITHHELD_ACCOUNT = 4294967295
#: The client order id of a trade's side withheld from a firm's reader.
WITHHELD_CL_ORD_ID = 18446744073709551615

Firms = Tuple[Optional[int], Optional[int]]


def _firms(d: Mapping[str, Any]) -> Firms:
    f = d.get("firms") or [None, None]
    return (f[0], f[1])


@dataclass(frozen=True)
class Fill:
    """One side of a trade."""

    order_id: int
    account: int
    cl_ord_id: int
    qty_leaves: int
    qty_filled: int

    @property
    def withheld(self) -> bool:
        """Whether this side is the counterparty's, withheld from a firm's reader."""
        return self.account == WITHHELD_ACCOUNT and self.cl_ord_id == WITHHELD_CL_ORD_ID

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Fill":
        return Fill(
            order_id=int(d["order_id"]),
            account=int(d["account"]),
            cl_ord_id=int(d["cl_ord_id"]),
            qty_leaves=int(d["qty_leaves"]),
            qty_filled=int(d["qty_filled"]),
        )


@dataclass(frozen=True)
class _Base:
    core: int
    index: int
    ord: int
    firms: Firms
    ts_ns: int

    @property
    def pos(self) -> Tuple[int, int, int]:
        """``(core, index, ord)``: a record's place; within a core, cursor order is
        ``(index, ord)`` order."""
        return (self.core, self.index, self.ord)


@dataclass(frozen=True)
class OrderState(_Base):
    """An order's latest state: the core's order-log record (``"event":"order_log"``)."""

    rec: int
    seq: int
    action: str  # new, change, delete
    status: str  # new, partially_filled, filled, cancelled, replaced, expired
    order_id: int
    instrument: int
    account: int
    firm: Optional[int]
    cl_ord_id: int
    side: str
    price: int
    qty_display: int
    qty_leaves: int
    qty_filled: int
    qty_total: int
    raw: Dict[str, Any] = field(compare=False, repr=False, hash=False)

    event = "order_log"

    @property
    def is_final(self) -> bool:
        """The order left the book: nothing will replace this state."""
        return self.action == "delete"


@dataclass(frozen=True)
class Trade(_Base):
    """One match. To a firm's reader, the other firm's side is withheld (``Fill.withheld``,
    its entry of ``firms`` ``None``)."""

    trade_id: int
    instrument: int
    price: int
    qty: int
    aggressor: str
    buy: Fill
    sell: Fill
    auction: bool
    raw: Dict[str, Any] = field(compare=False, repr=False, hash=False)

    event = "trade"


@dataclass(frozen=True)
class OrderRejected(_Base):
    """A new order the core refused (``reason`` as in docs/engine-jsonl.md)."""

    account: int
    cl_ord_id: int
    instrument: int
    reason: str
    raw: Dict[str, Any] = field(compare=False, repr=False, hash=False)

    event = "order_rejected"


@dataclass(frozen=True)
class OtherRecord(_Base):
    """A record of an event kind this version of the package does not know: see ``raw``."""

    kind: str
    raw: Dict[str, Any] = field(compare=False, repr=False, hash=False)

    @property
    def event(self) -> str:
        return self.kind


Record = Union[OrderState, Trade, OrderRejected, OtherRecord]


def record_from_dict(d: Dict[str, Any]) -> Record:
    """One record of a ``GET /v1/orders`` answer as a dataclass; ``raw`` is ``d`` itself."""
    core, index, ord_ = int(d["core"]), int(d["index"]), int(d["ord"])
    firms, ts_ns = _firms(d), int(d.get("ts_ns", 0))
    kind = d.get("event")
    if kind == "order_log":
        return OrderState(
            core=core, index=index, ord=ord_, firms=firms, ts_ns=ts_ns,
            rec=int(d["rec"]),
            seq=int(d["seq"]),
            action=str(d["action"]),
            status=str(d["status"]),
            order_id=int(d["order_id"]),
            instrument=int(d["instrument"]),
            account=int(d["account"]),
            firm=None if d.get("firm") is None else int(d["firm"]),
            cl_ord_id=int(d["cl_ord_id"]),
            side=str(d["side"]),
            price=int(d["price"]),
            qty_display=int(d["qty_display"]),
            qty_leaves=int(d["qty_leaves"]),
            qty_filled=int(d["qty_filled"]),
            qty_total=int(d["qty_total"]),
            raw=d,
        )
    if kind == "trade":
        return Trade(
            core=core, index=index, ord=ord_, firms=firms, ts_ns=ts_ns,
            trade_id=int(d["trade_id"]),
            instrument=int(d["instrument"]),
            price=int(d["price"]),
            qty=int(d["qty"]),
            aggressor=str(d["aggressor"]),
            buy=Fill.from_dict(d["buy"]),
            sell=Fill.from_dict(d["sell"]),
            auction=bool(d.get("auction", False)),
            raw=d,
        )
    if kind == "order_rejected":
        return OrderRejected(
            core=core, index=index, ord=ord_, firms=firms, ts_ns=ts_ns,
            account=int(d["account"]),
            cl_ord_id=int(d["cl_ord_id"]),
            instrument=int(d["instrument"]),
            reason=str(d["reason"]),
            raw=d,
        )
    return OtherRecord(core=core, index=index, ord=ord_, firms=firms, ts_ns=ts_ns,
                       kind=str(kind), raw=d)

"""Allocating ResourceClaims on one node, as kube-scheduler's DynamicResources plugin does.

Pure functions over the API objects (ResourceSlices, DeviceClasses, ResourceClaims):
- `node_devices` reads a node's devices from its slices (only the newest generation of each
  pool counts, as upstream requires while a driver republishes);
- `Usage` sums what allocated claims, and claims this scheduler has allocated but not yet seen
  written (in flight), consume of each device: capacity per device for devices that allow
  multiple allocations (KEP-5075), whole devices otherwise;
- `parse_requests` reads a claim's requests, refusing with a reason naming the request what
  this allocator does not do (firstAvailable, allocationMode All, admin access, constraints);
- `allocate` picks devices for every request of a claim on one node: class and request CEL
  selectors (`cel`), untolerated NoSchedule/NoExecute taints, remaining capacity after the
  request policy rounds the request up (or takes its default: all of the device for Alnair's
  GPUs), tightest fit first so large holes stay open. It returns the `status.allocation`
  results to write, or the reason no device fits, naming the request.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from alnair.common.errors import InvalidValueError
from alnair.common.resources import parse_quantity
from alnair.scheduler.dra.cel import DeviceView, Predicate, compile_selector, semver_tuple

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]
"""(driver, pool, device)."""


class UnsupportedClaim(InvalidValueError):
    """A claim or request shape this allocator does not allocate."""


@dataclass(frozen=True)
class CapacitySpec:
    value: Decimal
    default: Decimal | None = None
    minimum: Decimal | None = None
    maximum: Decimal | None = None
    step: Decimal | None = None
    valid_values: tuple[Decimal, ...] = ()

    def consumed(self, requested: Decimal | None) -> Decimal | None:
        """What a request consumes under the policy; None when the policy refuses it."""
        if requested is None:
            return self.default if self.default is not None else self.value
        if self.valid_values:
            return next((v for v in self.valid_values if v >= requested), None)
        amount = requested
        if self.minimum is not None:
            amount = max(amount, self.minimum)
            if self.step:
                steps = ((amount - self.minimum) / self.step).to_integral_value(
                    rounding=ROUND_CEILING
                )
                amount = self.minimum + steps * self.step
        if self.maximum is not None and amount > self.maximum:
            return None
        return amount


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    view: DeviceView
    capacity: Mapping[str, CapacitySpec]
    taints: tuple[Taint, ...] = ()

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)


def _attribute(raw: Mapping[str, Any]) -> Any:
    for kind in ("string", "int", "bool"):
        if kind in raw:
            return raw[kind]
    if "version" in raw:
        return semver_tuple(str(raw["version"]))
    return None


def _capacity(raw: Mapping[str, Any]) -> CapacitySpec:
    policy = raw.get("requestPolicy") or {}
    rng = policy.get("validRange") or {}

    def q(v: Any) -> Decimal | None:
        return None if v is None else parse_quantity(v)

    return CapacitySpec(
        value=parse_quantity(raw["value"]),
        default=q(policy.get("default")),
        minimum=q(rng.get("min")),
        maximum=q(rng.get("max")),
        step=q(rng.get("step")),
        valid_values=tuple(parse_quantity(v) for v in policy.get("validValues") or ()),
    )


def _qualified(name: str, driver: str) -> str:
    prefix = driver + "/"
    return name[len(prefix) :] if name.startswith(prefix) else name


def node_devices(slices: Iterable[Obj], node: str) -> list[Device]:
    """The devices of `node`'s slices, newest pool generation only."""
    mine = [s for s in slices if (s.get("spec") or {}).get("nodeName") == node]
    newest: dict[tuple[str, str], int] = {}
    for s in mine:
        spec = s["spec"]
        key = (spec["driver"], spec["pool"]["name"])
        newest[key] = max(newest.get(key, 0), int(spec["pool"].get("generation", 0)))
    out: list[Device] = []
    for s in mine:
        spec = s["spec"]
        driver, pool = spec["driver"], spec["pool"]["name"]
        if int(spec["pool"].get("generation", 0)) != newest[(driver, pool)]:
            continue
        for d in spec.get("devices") or []:
            attrs = {
                _qualified(k, driver): _attribute(v) for k, v in (d.get("attributes") or {}).items()
            }
            caps = {
                _qualified(k, driver): _capacity(v) for k, v in (d.get("capacity") or {}).items()
            }
            out.append(
                Device(
                    driver=driver,
                    pool=pool,
                    name=d["name"],
                    view=DeviceView(
                        driver=driver,
                        attributes=attrs,
                        capacity={k: c.value for k, c in caps.items()},
                        allow_multiple=bool(d.get("allowMultipleAllocations")),
                    ),
                    capacity=caps,
                    taints=tuple(
                        Taint(t["key"], t.get("value", ""), t["effect"])
                        for t in d.get("taints") or []
                    ),
                )
            )
    return out


# --------------------------------------------------------------------------- usage


@dataclass
class Usage:
    """Consumption of every device by allocated and in-flight claims (keyed by claim uid)."""

    by_claim: dict[str, list[Obj]] = field(default_factory=dict)

    def set_claim(self, uid: str, results: Sequence[Obj]) -> None:
        if results:
            self.by_claim[uid] = list(results)
        else:
            self.by_claim.pop(uid, None)

    def forget(self, uid: str) -> None:
        self.by_claim.pop(uid, None)

    def totals(self) -> tuple[dict[DeviceKey, dict[str, Decimal]], set[DeviceKey]]:
        """Consumed capacity per shared device, and devices held whole (no consumedCapacity)."""
        used: dict[DeviceKey, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
        whole: set[DeviceKey] = set()
        for results in self.by_claim.values():
            for r in results:
                key = (r["driver"], r["pool"], r["device"])
                consumed = r.get("consumedCapacity")
                if consumed is None:
                    whole.add(key)
                    continue
                for name, q in consumed.items():
                    used[key][name] += parse_quantity(q)
        return used, whole


def claim_results(claim: Obj) -> list[Obj]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return list((alloc.get("devices") or {}).get("results") or [])


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    name: str
    device_class: str
    selectors: tuple[str, ...]
    count: int
    capacity: Mapping[str, Decimal]
    tolerations: tuple[Obj, ...] = ()


def parse_requests(claim: Obj) -> list[Request]:
    meta = claim.get("metadata") or {}
    ref = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    devices = (claim.get("spec") or {}).get("devices") or {}
    if devices.get("constraints"):
        raise UnsupportedClaim("claim", ref, "device constraints are not supported")
    out = []
    for req in devices.get("requests") or []:
        name = req.get("name", "")
        exact = req.get("exactly")
        if exact is None:
            raise UnsupportedClaim(
                "request", f"{ref}/{name}", "firstAvailable is not supported; use exactly"
            )
        mode = exact.get("allocationMode", "ExactCount")
        if mode != "ExactCount":
            raise UnsupportedClaim("request", f"{ref}/{name}", f"allocationMode {mode}")
        if exact.get("adminAccess"):
            raise UnsupportedClaim("request", f"{ref}/{name}", "adminAccess is not supported")
        selectors = tuple(
            s["cel"]["expression"] for s in exact.get("selectors") or [] if s.get("cel")
        )
        caps = (exact.get("capacity") or {}).get("requests") or {}
        out.append(
            Request(
                name=name,
                device_class=exact["deviceClassName"],
                selectors=selectors,
                count=int(exact.get("count", 1)),
                capacity={k: parse_quantity(v, f"{ref}/{name} {k}") for k, v in caps.items()},
                tolerations=tuple(exact.get("tolerations") or ()),
            )
        )
    return out


def _tolerates(tolerations: Sequence[Obj], taint: Taint) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        op = t.get("operator", "Equal")
        if not t.get("key") and op == "Exists":
            return True
        if t.get("key") != taint.key:
            continue
        if op == "Exists" or t.get("value", "") == taint.value:
            return True
    return False


@dataclass(frozen=True)
class Allocation:
    results: tuple[Obj, ...] = ()
    reason: str = ""
    """Why the claim cannot be allocated on the node; empty on success."""


def allocate(
    claim: Obj,
    requests: Sequence[Request],
    devices: Sequence[Device],
    classes: Mapping[str, Obj],
    usage: Usage,
    *,
    new_share_id: Any = None,
) -> Allocation:
    """Allocate every request of `claim` on one node's `devices`, or say why not."""
    used, whole = usage.totals()
    taken: dict[DeviceKey, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    taken_whole: set[DeviceKey] = set()
    results: list[Obj] = []
    for req in requests:
        cls = classes.get(req.device_class)
        if cls is None:
            return Allocation(
                reason=f"request {req.name}: DeviceClass {req.device_class} not found"
            )
        exprs = [
            s["cel"]["expression"]
            for s in (cls.get("spec") or {}).get("selectors") or []
            if s.get("cel")
        ] + list(req.selectors)
        picked: list[tuple[Device, dict[str, Decimal] | None]] = []
        tainted = short = 0
        matched = 0
        for dev in devices:
            preds: list[Predicate] = [compile_selector(e, dev.driver) for e in exprs]
            if not all(p(dev.view) for p in preds):
                continue
            matched += 1
            if any(
                t.effect in ("NoSchedule", "NoExecute") and not _tolerates(req.tolerations, t)
                for t in dev.taints
            ):
                tainted += 1
                continue
            if dev.key in whole or dev.key in taken_whole:
                short += 1
                continue
            if not dev.view.allow_multiple:
                if used.get(dev.key) or taken.get(dev.key):
                    short += 1
                    continue
                picked.append((dev, None))
                continue
            consumed: dict[str, Decimal] = {}
            fits = True
            for cap_name, spec in dev.capacity.items():
                amount = spec.consumed(req.capacity.get(cap_name))
                free = spec.value - used.get(dev.key, {}).get(cap_name, Decimal(0))
                free -= taken.get(dev.key, {}).get(cap_name, Decimal(0))
                if amount is None or amount > free:
                    fits = False
                    break
                consumed[cap_name] = amount
            unknown = set(req.capacity) - set(dev.capacity)
            if not fits or unknown:
                short += 1
                continue
            picked.append((dev, consumed))
        if len(picked) < req.count:
            why = f"request {req.name}: {matched} device(s) of class {req.device_class} match"
            if tainted:
                why += f", {tainted} tainted"
            if short:
                want = ", ".join(f"{k} {_quantity(v)}" for k, v in sorted(req.capacity.items()))
                why += f", {short} without room" + (f" for {want}" if want else "")
            return Allocation(reason=why + f"; {req.count} needed")

        def room(item: tuple[Device, dict[str, Decimal] | None]) -> tuple[Decimal, str]:
            dev, _ = item
            spare = sum(
                (
                    spec.value
                    - used.get(dev.key, {}).get(n, Decimal(0))
                    - taken.get(dev.key, {}).get(n, Decimal(0))
                )
                / spec.value
                for n, spec in dev.capacity.items()
                if spec.value
            )
            return (Decimal(spare), dev.name)

        for dev, share in sorted(picked, key=room)[: req.count]:
            result: Obj = {
                "request": req.name,
                "driver": dev.driver,
                "pool": dev.pool,
                "device": dev.name,
            }
            if share is None:
                taken_whole.add(dev.key)
            else:
                for n, v in share.items():
                    taken[dev.key][n] += v
                result["consumedCapacity"] = {n: _quantity(v) for n, v in share.items()}
                if new_share_id is not None:
                    result["shareID"] = str(new_share_id())
            results.append(result)
    return Allocation(results=tuple(results))


def _quantity(value: Decimal) -> str:
    mib = Decimal(1 << 20)
    if value >= mib and value % mib == 0:
        return f"{int(value / mib)}Mi"
    return str(value.normalize()) if value != value.to_integral_value() else str(int(value))

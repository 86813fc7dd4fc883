# Verity sandbox wire format, shared by the harness (which decides verdicts and never runs
# untrusted code) and the child processes that run untrusted code. Messages are a 4-byte length
# and one JSON value. Values are plain data, written in a tagged form so that tuples, sets, bytes,
# complex numbers and non-string dict keys survive: a JSON scalar is itself (null, bool, int,
# float, str); {"l": [...]} list, {"t": [...]} tuple, {"s": [...]} set, {"f": [...]} frozenset,
# {"d": [[k, v], ...]} dict, {"b": hex} bytes, {"c": [re, im]} complex, {"p": n} the child's
# object number n (an opaque program object), {"m": [name, n]} a module (name, and object n).
# Decoding builds exact built-in types only and never runs code carried by the message.
import json as _json
import os as _os
import sys as _sys

MAX_MESSAGE = 16 << 20
_SCALARS = (type(None), bool, int, float, str)


class WireError(Exception):
    """The peer broke the protocol (a closed pipe, a bad length, a malformed value)."""


if hasattr(_sys, "set_int_max_str_digits"):
    _sys.set_int_max_str_digits(0)  # big integers cross by value (the message size bounds them)


def send(fd, message):
    data = _json.dumps(message, separators=(",", ":"), allow_nan=True).encode("utf-8", "surrogatepass")
    if len(data) > MAX_MESSAGE:
        raise WireError("message too large")
    data = len(data).to_bytes(4, "big") + data
    while data:
        try:
            n = _os.write(fd, data)
        except OSError as e:
            raise WireError("the peer closed the channel") from e
        data = data[n:]


def _read_exact(fd, n):
    parts = []
    while n > 0:
        try:
            chunk = _os.read(fd, min(n, 1 << 20))
        except OSError as e:
            raise WireError("the peer closed the channel") from e
        if not chunk:
            raise WireError("the peer closed the channel")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def recv(fd):
    size = int.from_bytes(_read_exact(fd, 4), "big")
    if size > MAX_MESSAGE:
        raise WireError("message too large")
    try:
        return _json.loads(_read_exact(fd, size).decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as e:
        raise WireError("malformed message") from e


def encode(value, other, depth=0):
    """Tagged JSON for `value`; `other(x)` encodes anything that is not exact plain data."""
    t = type(value)
    if t in _SCALARS:
        return value
    if depth > 64:
        return other(value)
    d = depth + 1
    if t is list:
        return {"l": [encode(x, other, d) for x in value]}
    if t is tuple:
        return {"t": [encode(x, other, d) for x in value]}
    if t is dict:
        return {"d": [[encode(k, other, d), encode(v, other, d)] for k, v in value.items()]}
    if t is set:
        return {"s": [encode(x, other, d) for x in value]}
    if t is frozenset:
        return {"f": [encode(x, other, d) for x in value]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [value.real, value.imag]}
    return other(value)


def decode(node, program_object, module=None, depth=0):
    """The value of a tagged node; `program_object(n)` and `module(name, n)` map references.
    Raises WireError on anything malformed."""
    t = type(node)
    if t is bool or t is int or t is float or t is str or node is None:
        return node
    if t is not dict or len(node) != 1 or depth > 200:
        raise WireError("malformed value")
    ((tag, body),) = node.items()
    d = depth + 1

    def items():
        if type(body) is not list:
            raise WireError("malformed value")
        return [decode(x, program_object, module, d) for x in body]

    try:
        if tag == "l":
            return items()
        if tag == "t":
            return tuple(items())
        if tag == "s":
            return set(items())
        if tag == "f":
            return frozenset(items())
        if tag == "d" and type(body) is list:
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise WireError("malformed value")
                out[decode(pair[0], program_object, module, d)] = decode(pair[1], program_object, module, d)
            return out
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
            return complex(body[0], body[1])
        if tag == "p" and type(body) is int and body >= 0:
            return program_object(body)
        if tag == "m" and module is not None and type(body) is list and len(body) == 2 \
                and type(body[0]) is str and type(body[1]) is int and body[1] >= 0:
            return module(body[0], body[1])
    except TypeError as e:  # an unhashable key or set member
        raise WireError("malformed value") from e
    except ValueError as e:
        raise WireError("malformed value") from e
    raise WireError("malformed value")

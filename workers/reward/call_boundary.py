"""The boundary between a trusted test and the candidate function it calls in the sandbox.

The code verifier runs a problem's tests in its own (trusted) process; ``candidate`` there is a proxy
whose every call crosses two pipes to the sandboxed program and back. Only *plain data* crosses:
``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` and ``list`` / ``tuple`` / ``dict`` /
``set`` / ``frozenset`` of them, recognised by exact type (``type(x) is int``: a subclass with its
own ``__eq__`` is not plain). Values travel as tagged JSON (never pickle) and are rebuilt from the
tags on the other side, so what the trusted side compares is always a genuine builtin — an object
equal to everything cannot exist there — and a candidate that mutates its arguments mutates only
its own copy. Exceptions come back as their type name and message.

Standard library only: ``serve`` runs inside the sandbox, where the project is not importable (the
verifier ships this module's source into the sandboxed program).

Frame: 4-byte big-endian length, then that many bytes of UTF-8 JSON.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys

MAX_FRAME_BYTES = 8 << 20  # one call's arguments or result, encoded
MAX_DEPTH = 64  # nesting of containers

_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """A frame or a value that breaks the format (from the candidate side: the check fails)."""


class NotPlainData(ProtocolError):
    """A value that is not plain data."""


# --- values ---------------------------------------------------------------------------------------

def encode(value: object, depth: int = 0) -> list:
    """``value`` as tagged JSON-able lists; raises ``NotPlainData`` for anything else."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", format(value, "x")]  # hex: no 4300-digit limit, linear time
    if kind is float:
        return ["f", value.hex() if math.isfinite(value) else repr(value)]  # 'nan', 'inf', '-inf'
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[kind]
        return [tag, [encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[encode(key, depth + 1), encode(item, depth + 1)] for key, item in value.items()]]
    raise NotPlainData(f"a {kind.__name__} is not plain data")


def decode(node: object, depth: int = 0) -> object:
    """The builtin value ``node`` encodes; raises ``ProtocolError`` for anything malformed."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"nested deeper than {MAX_DEPTH}")
    if type(node) is not list or not node or type(node[0]) is not str:
        raise ProtocolError("a value must be a tagged list")
    tag, body = node[0], node[1:]
    if tag == "n" and not body:
        return None
    if len(body) != 1:
        raise ProtocolError(f"tag {tag!r} with {len(body)} fields")
    payload = body[0]
    if tag == "b" and type(payload) is bool:
        return bool(payload)
    if tag == "i" and type(payload) is str:
        return _decode_int(payload)
    if tag == "f" and type(payload) is str:
        return _decode_float(payload)
    if tag == "s" and type(payload) is str:
        return str(payload)
    if tag == "y" and type(payload) is str:
        try:
            return bytes.fromhex(payload)
        except ValueError:
            raise ProtocolError("malformed bytes") from None
    if tag in ("l", "t", "S", "F") and type(payload) is list:
        items = [decode(item, depth + 1) for item in payload]
        try:
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        except TypeError as error:  # an unhashable set member
            raise ProtocolError(str(error)) from None
    if tag == "d" and type(payload) is list:
        result = {}
        for pair in payload:
            if type(pair) is not list or len(pair) != 2:
                raise ProtocolError("a dict item must be a [key, value] pair")
            key = decode(pair[0], depth + 1)
            try:
                result[key] = decode(pair[1], depth + 1)
            except TypeError as error:  # an unhashable key
                raise ProtocolError(str(error)) from None
        return result
    raise ProtocolError(f"unknown tag {tag!r} or wrong field type")


def _decode_int(text: str) -> int:
    digits = text[1:] if text.startswith("-") else text
    if not digits or any(char not in "0123456789abcdef" for char in digits):
        raise ProtocolError("malformed int")
    return int(text, 16)


def _decode_float(text: str) -> float:
    if text in ("nan", "inf", "-inf"):
        return float(text)
    try:
        return float.fromhex(text)
    except (ValueError, OverflowError):
        raise ProtocolError("malformed float") from None


# --- frames ---------------------------------------------------------------------------------------

def write_frame_bytes(message: object) -> bytes:
    """The frame that carries ``message`` (JSON-able lists and dicts of encoded values)."""
    data = json.dumps(message, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise NotPlainData(f"a message of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(data)) + data


def write_frame(fd: int, message: object) -> None:
    view = memoryview(write_frame_bytes(message))
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int, read_exactly) -> object:
    """One message; ``read_exactly(fd, n)`` returns n bytes or raises (EOF, deadline)."""
    (length,) = _HEADER.unpack(read_exactly(fd, _HEADER.size))
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"a frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        return json.loads(read_exactly(fd, length))
    except (ValueError, RecursionError) as error:
        raise ProtocolError(f"not JSON: {type(error).__name__}") from None


def read_exactly(fd: int, size: int, wait=None) -> bytes:
    """``size`` bytes from ``fd``; ``wait(fd)``, if given, runs before each read (the trusted side's deadline)."""
    chunks, needed = [], size
    while needed:
        if wait is not None:
            wait(fd)
        chunk = os.read(fd, needed)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        needed -= len(chunk)
    return b"".join(chunks)


# --- the sandboxed side ---------------------------------------------------------------------------

def serve(function_name: str, namespace: dict, request_fd: int, response_fd: int) -> None:
    """Answer call requests with ``namespace[function_name]`` until the trusted side closes the pipe.

    Request: ``{"args": [...], "kwargs": [[name, value], ...]}``. Response: ``{"return": value}`` or
    ``{"raise": [type name, message]}``. Nothing here is trusted by the other side.
    """
    function = namespace.get(function_name)
    while True:
        try:
            request = read_frame(request_fd, read_exactly)
        except EOFError:
            return
        try:
            if not callable(function):
                raise NameError(f"name {function_name!r} is not defined (or not a function)")
            args = decode(request["args"])
            kwargs = {name: decode(value) for name, value in request["kwargs"]}
            response = {"return": encode(function(*args, **kwargs))}
        except SystemExit:
            raise
        except BaseException as error:  # noqa: BLE001 - the candidate's exception goes back as data
            response = {"raise": [type(error).__name__ if type(type(error).__name__) is str else "Exception",
                                  _message(error)]}
        write_frame(response_fd, response)


def _message(error: BaseException) -> str:
    try:
        text = str(error)
    except BaseException:  # noqa: BLE001
        text = ""
    return text[:500] if type(text) is str else ""


def run_server_main(function_name: str, source: str, filename: str, request_fd: int, response_fd: int) -> None:
    """Body of the sandboxed program: define the candidate, then serve calls to it."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    code = compile(source, filename, "exec")
    exec(code, namespace)  # noqa: S102 - the candidate's program, inside the sandbox
    sys.stdout.flush()
    serve(function_name, namespace, request_fd, response_fd)

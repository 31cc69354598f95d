"""A byte-stable layout for ORT-format files.

onnxruntime serialises an ORT file's model deterministically, but writes the kernel type string
resolver (the table a minimal build uses to match kernels) by iterating a hash map whose order
follows heap addresses, which differ on every run (ASLR). The tables' logical content and sort
order are the same each time; only where the builder placed them in the buffer changes, so two
runs of the same conversion differ in a few hundred bytes at the front of the file.

A flatbuffer is built back to front: everything onnxruntime built before the model's root table
(the whole model subtree) is one contiguous suffix of the file, addressed by offsets relative to
the buffer's end. `canonical_ort` keeps that suffix byte for byte, rebuilds the resolver with its
tables written in their (key-sorted) vector order, and writes a fresh root table. Schema (onnxruntime
`core/flatbuffers/schema/ort.fbs`):

    table InferenceSession { ort_version:string; model:Model; (deprecated); kernel_type_str_resolver; }
    table KernelTypeStrResolver { op_kernel_type_str_args:[OpIdKernelTypeStrArgsEntry]; }
    table OpIdKernelTypeStrArgsEntry { op_id:string (key); kernel_type_str_args:[KernelTypeStrArgsEntry]; }
    table KernelTypeStrArgsEntry { kernel_type_str:string (key); args:[ArgTypeAndIndex]; }
    table ArgTypeAndIndex { arg_type:ArgType (byte); index:uint32; }
"""

from __future__ import annotations

import struct

IDENTIFIER = b"ORTM"


class LayoutError(ValueError):
    """The file does not have the layout this module knows; it is left as onnxruntime wrote it."""


def _u32(buf, pos: int) -> int:
    return struct.unpack_from("<I", buf, pos)[0]


def _table(buf, pos: int):
    from flatbuffers.table import Table

    return Table(buf, pos)


def _field(tab, slot: int) -> int:
    """Offset of field `slot` inside its table, 0 when absent."""
    return tab.Offset(4 + 2 * slot)


def _child(tab, slot: int) -> int | None:
    o = _field(tab, slot)
    return tab.Indirect(tab.Pos + o) if o else None


def _string(tab, slot: int) -> bytes:
    o = _field(tab, slot)
    if not o:
        raise LayoutError("a key string is missing")
    return bytes(tab.String(tab.Pos + o))


def _vector(tab, slot: int) -> list[int]:
    """Positions of the tables in vector field `slot`."""
    o = _field(tab, slot)
    if not o:
        return []
    start, n = tab.Vector(o), tab.VectorLen(o)
    return [tab.Indirect(start + 4 * i) for i in range(n)]


def _read_resolver(buf, pos: int) -> tuple[list, int]:
    """The resolver as plain data (vectors in the order onnxruntime sorted them by key), and the
    highest buffer position any of it occupies."""
    from flatbuffers import number_types

    highest = pos
    entries = []
    for op_pos in _vector(_table(buf, pos), 0):
        op = _table(buf, op_pos)
        kts = []
        for kt_pos in _vector(op, 1):
            kt = _table(buf, kt_pos)
            args = []
            for a_pos in _vector(kt, 1):
                a = _table(buf, a_pos)
                arg_type = a.Get(number_types.Int8Flags, a.Pos + _field(a, 0)) if _field(a, 0) else 0
                index = a.Get(number_types.Uint32Flags, a.Pos + _field(a, 1)) if _field(a, 1) else 0
                args.append((arg_type, index))
                highest = max(highest, a_pos)
            kts.append((_string(kt, 0), args))
            highest = max(highest, kt_pos)
        entries.append((_string(op, 0), kts))
        highest = max(highest, op_pos)
    return entries, highest


def canonical_ort(data: bytes) -> bytes | bytearray:
    """The same ORT model with its resolver laid out in vector order (see the module docstring).

    Raises LayoutError when the file is not laid out as expected (an onnxruntime that builds the
    file differently); callers keep the original bytes then.
    """

    def fill(dst, start: int) -> None:
        dst[:] = memoryview(data)[start:]

    return _rebuilt(data, fill).Output()


def write_canonical(path) -> None:
    """Rewrite the ORT file at `path` in the canonical layout, holding one copy of it: the layout is
    read from the file memory-mapped, the model's part is read from the file straight into the new
    buffer, and the buffer is written as it is. (Reading the file whole, rebuilding it and taking
    the result out of the builder held it four times: 3.7 GB for a 0.93 GB encoder.) Raises
    LayoutError, and then leaves the file as it was."""
    import mmap

    with open(path, "rb") as f:
        def fill(dst, start: int) -> None:
            f.seek(start)
            done = 0
            while done < len(dst):
                n = f.readinto(dst[done:])
                if not n:
                    raise LayoutError("the file ended early")
                done += n

        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            b = _rebuilt(buf, fill)
    with open(path, "wb") as f:
        f.write(memoryview(b.Bytes)[b.Head():])


def _rebuilt(buf, fill):
    """A flatbuffers Builder holding the canonical form of the ORT file `buf`; `fill(dst, start)`
    copies the file's bytes from `start` to its end into the memoryview `dst`."""
    import flatbuffers

    if len(buf) < 16 or buf[4:8] != IDENTIFIER:
        raise LayoutError("not an ORT file")
    root = _table(buf, _u32(buf, 0))
    present = [s for s in range(8) if root.Offset(4 + 2 * s)]
    if not set(present) <= {0, 1, 3}:
        raise LayoutError(f"unexpected root fields {present}")
    model_pos = _child(root, 1)
    resolver_pos = _child(root, 3)
    if model_pos is None or resolver_pos is None:
        raise LayoutError("no model or no kernel type string resolver")
    version = _string(root, 0) if _field(root, 0) else None
    vtable = model_pos - struct.unpack_from("<i", buf, model_pos)[0]
    suffix_start = min(model_pos, vtable)
    entries, highest = _read_resolver(buf, resolver_pos)
    if highest >= suffix_start or _u32(buf, 0) >= suffix_start:
        raise LayoutError("the resolver is not laid out before the model")
    if len(buf) % 4:
        raise LayoutError("unaligned file size")

    suffix = len(buf) - suffix_start
    # room for the rebuilt front (what the file has before the suffix, and slack): a builder that
    # runs out doubles its buffer, a copy of the whole model
    b = flatbuffers.Builder(suffix + 2 * suffix_start + 1024 + 64 * len(entries))
    # The suffix keeps its distance from the buffer's end, so its offsets and alignment hold.
    b.head -= suffix
    with memoryview(b.Bytes) as dst:
        fill(dst[b.head:b.head + suffix], suffix_start)
    b.minalign = 8
    model_ref = len(buf) - model_pos

    op_refs = []
    for op_id, kts in entries:
        kt_refs = []
        for kt_str, args in kts:
            arg_refs = []
            for arg_type, index in args:
                b.StartObject(2)
                b.PrependUint32Slot(1, index, 0)
                b.PrependInt8Slot(0, arg_type, 0)
                arg_refs.append(b.EndObject())
            name = b.CreateSharedString(kt_str)
            args_vec = _offset_vector(b, arg_refs)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, name, 0)
            b.PrependUOffsetTRelativeSlot(1, args_vec, 0)
            kt_refs.append(b.EndObject())
        name = b.CreateSharedString(op_id)
        kts_vec = _offset_vector(b, kt_refs)
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(0, name, 0)
        b.PrependUOffsetTRelativeSlot(1, kts_vec, 0)
        op_refs.append(b.EndObject())
    ops_vec = _offset_vector(b, op_refs)
    b.StartObject(1)
    b.PrependUOffsetTRelativeSlot(0, ops_vec, 0)
    resolver_ref = b.EndObject()
    version_ref = b.CreateString(version) if version is not None else None

    b.StartObject(4)
    if version_ref is not None:
        b.PrependUOffsetTRelativeSlot(0, version_ref, 0)
    b.PrependUOffsetTRelativeSlot(1, model_ref, 0)
    b.PrependUOffsetTRelativeSlot(3, resolver_ref, 0)
    b.Finish(b.EndObject(), file_identifier=IDENTIFIER)
    return b


def _offset_vector(b, refs: list[int]) -> int:
    b.StartVector(4, len(refs), 4)
    for r in reversed(refs):
        b.PrependUOffsetTRelative(r)
    return b.EndVector()

"""How chunkernels.interop hands PyTorch's CUDA stream to CuPy (no torch or GPU needed)."""


def test_external_stream_through_the_cuda_stream_protocol():
    """PyTorch's stream reaches CuPy through Stream.from_external and the CUDA stream protocol
    where CuPy has it (14 and later deprecate ExternalStream), else through ExternalStream."""
    import types

    from chunkernels.interop import _cupy_stream

    seen = {}

    class Stream:
        @classmethod
        def from_external(cls, obj):
            seen["protocol"] = obj.__cuda_stream__()
            return "from_external"

    def external(handle, device):
        seen["external"] = (handle, device)
        return "ExternalStream"

    new = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=Stream, ExternalStream=external))
    assert _cupy_stream(new, 0x1234, 1) == "from_external"
    assert seen == {"protocol": (0, 0x1234)}
    old = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=object, ExternalStream=external))
    assert _cupy_stream(old, 0x1234, 1) == "ExternalStream"
    assert seen["external"] == (0x1234, 1)

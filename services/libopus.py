"""libopus through ctypes: 20 ms mono frames in and out, nothing else.

Why not PyAV's codec contexts: per 20 ms frame they wrap the PCM in an AudioFrame, run it
through a libavfilter graph to re-chunk it, and make Packet/AudioFrame objects on the way
out; measured in the transceiver that doubled the cost of encoding (docs/transceiver.md,
"CPU per session-second"). The library is the one PyAV's wheel bundles (so every install
that has aiortc has it), else the system's libopus.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os

import av

APPLICATION = {"voip": 2048, "audio": 2049, "lowdelay": 2051}  # OPUS_APPLICATION_*
_SET_BITRATE, _SET_COMPLEXITY = 4002, 4010                      # opus_defines.h requests
AUTO_BITRATE = -1000                                            # OPUS_AUTO: libopus chooses
_MAX_PACKET = 1500
_MAX_SAMPLES = 5760  # 120 ms at 48 kHz: the longest packet Opus has


def _load() -> ctypes.CDLL:
    bundled = sorted(glob.glob(os.path.join(os.path.dirname(av.__file__), os.pardir,
                                            "av.libs", "libopus-*.so*")))
    path = bundled[0] if bundled else ctypes.util.find_library("opus")
    if path is None:
        raise ImportError("libopus not found (neither in PyAV's wheel nor on the system)")
    lib = ctypes.CDLL(path)
    lib.opus_encoder_create.restype = ctypes.c_void_p
    lib.opus_encoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int)]
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int)]
    lib.opus_encode.restype = ctypes.c_int32
    lib.opus_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_int32]
    lib.opus_decode.restype = ctypes.c_int
    lib.opus_decode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.opus_encoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_strerror.restype = ctypes.c_char_p
    lib.opus_strerror.argtypes = [ctypes.c_int]
    return lib


_lib = _load()


class OpusError(ValueError):
    pass


def _check(code: int) -> int:
    if code < 0:
        raise OpusError(_lib.opus_strerror(code).decode())
    return code


class Encoder:
    """A mono 48 kHz libopus encoder: ``encode(pcm)`` takes one s16le frame, returns a packet."""

    def __init__(self, application: str, bitrate: int, complexity: int,
                 frame_samples: int = 960) -> None:
        error = ctypes.c_int()
        self._state = _lib.opus_encoder_create(48000, 1, APPLICATION[application],
                                               ctypes.byref(error))
        _check(error.value)
        state = ctypes.c_void_p(self._state)
        _check(_lib.opus_encoder_ctl(state, _SET_BITRATE, ctypes.c_int32(bitrate)))
        _check(_lib.opus_encoder_ctl(state, _SET_COMPLEXITY, ctypes.c_int32(complexity)))
        self._frame_samples = frame_samples
        self._out = ctypes.create_string_buffer(_MAX_PACKET)

    def encode(self, pcm: bytes) -> bytes:
        size = _check(_lib.opus_encode(self._state, pcm, self._frame_samples, self._out,
                                       _MAX_PACKET))
        return ctypes.string_at(self._out, size)

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            _lib.opus_encoder_destroy(self._state)
            self._state = None


class Decoder:
    """A mono 48 kHz libopus decoder: ``decode(packet)`` returns s16le PCM (all its frames)."""

    def __init__(self) -> None:
        error = ctypes.c_int()
        self._state = _lib.opus_decoder_create(48000, 1, ctypes.byref(error))
        _check(error.value)
        self._out = ctypes.create_string_buffer(_MAX_SAMPLES * 2)

    def decode(self, packet: bytes) -> bytes:
        samples = _check(_lib.opus_decode(self._state, packet, len(packet), self._out,
                                          _MAX_SAMPLES, 0))
        return ctypes.string_at(self._out, samples * 2)

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            _lib.opus_decoder_destroy(self._state)
            self._state = None

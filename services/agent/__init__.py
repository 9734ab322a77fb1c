"""The backend voice agent: a WebSocket service that gets 20 ms PCM frames and JSON events for one
call session from a transceiver, and answers with audio (echo, or a tone after the caller stops
speaking) and events. It knows nothing about WebRTC; the protocol is docs/agent-protocol.md."""

//! A protocol client in Rust (for tests, benchmarks and scripts): connects to `/api/chat`, sends
//! PCM as Ogg/Opus like Kyutai's clients do, and receives decoded audio, text, metadata and
//! errors.

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::ogg_opus::{OggOpusError, OggOpusReader, OggOpusWriter, OpusPacketing, PreSkip};
use crate::protocol::{self, MessageKind};

/// Most audio decoded from one server message (24 kHz samples).
const MAX_SAMPLES_PER_MESSAGE: usize = 24_000 * 5;

/// What went wrong on the client side.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("websocket: {0}")]
    Websocket(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("audio from the server: {0}")]
    Audio(#[from] OggOpusError),
}

/// One message from the server.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    Handshake,
    /// The PCM decoded from this message (may be empty while the stream headers arrive).
    Audio(Vec<f32>),
    Text(String),
    Metadata(serde_json::Value),
    Error(String),
    /// A kind this client does not handle (the server should never send one).
    Other {
        kind: u8,
        len: usize,
    },
    /// The server closed the connection (code, reason).
    Closed(Option<(u16, String)>),
}

/// The sending half.
pub struct ChatSender<S> {
    sink: SplitSink<WebSocketStream<S>, Message>,
    writer: OggOpusWriter,
}

/// The receiving half.
pub struct ChatReceiver<S> {
    stream: SplitStream<WebSocketStream<S>>,
    reader: OggOpusReader,
}

/// Connects to `url` (`ws://host:port/api/chat?...`); the audio sent is cut into `packeting`.
pub async fn connect(
    url: &str,
    packeting: OpusPacketing,
) -> Result<
    (
        ChatSender<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
        ChatReceiver<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    ),
    ClientError,
> {
    let (ws, _) = tokio_tungstenite::connect_async(url).await?;
    if let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = ws.get_ref() {
        let _ = tcp.set_nodelay(true);
    }
    Ok(split(ws, packeting)?)
}

/// Speaks the protocol over an established websocket (e.g. one opened over TLS).
pub fn split<S: AsyncRead + AsyncWrite + Unpin>(
    ws: WebSocketStream<S>,
    packeting: OpusPacketing,
) -> Result<(ChatSender<S>, ChatReceiver<S>), OggOpusError> {
    let (sink, stream) = ws.split();
    let serial = 0x6d6f_7368; // "mosh"
    Ok((
        ChatSender {
            sink,
            writer: OggOpusWriter::new(serial, packeting)?,
        },
        ChatReceiver {
            stream,
            reader: OggOpusReader::new(PreSkip::Discard),
        },
    ))
}

impl<S: AsyncRead + AsyncWrite + Unpin> ChatSender<S> {
    /// Encodes `pcm` (24 kHz mono) and sends the finished pages as one audio message, if any
    /// page is finished. Returns the bytes sent.
    pub async fn send_pcm(&mut self, pcm: &[f32]) -> Result<usize, ClientError> {
        let pages = self.writer.push(pcm)?;
        if pages.is_empty() {
            return Ok(0);
        }
        let message = protocol::audio(&pages);
        let len = message.len();
        self.sink.send(Message::Binary(message.into())).await?;
        Ok(len)
    }

    /// Sends any bytes as one binary message (for testing the server's input checks).
    pub async fn send_raw(&mut self, bytes: Vec<u8>) -> Result<(), ClientError> {
        self.sink.send(Message::Binary(bytes.into())).await?;
        Ok(())
    }

    /// Sends a text websocket message (not part of the protocol).
    pub async fn send_text(&mut self, text: &str) -> Result<(), ClientError> {
        self.sink.send(Message::Text(text.into())).await?;
        Ok(())
    }

    /// Sends a raw websocket frame as given (for testing the server's protocol checks: a text or
    /// close frame that is not UTF-8, which the message types cannot hold).
    pub async fn send_frame(
        &mut self,
        frame: tungstenite::protocol::frame::Frame,
    ) -> Result<(), ClientError> {
        self.sink.send(Message::Frame(frame)).await?;
        Ok(())
    }

    /// Starts the closing handshake.
    pub async fn close(&mut self) -> Result<(), ClientError> {
        let frame = CloseFrame {
            code: CloseCode::Normal,
            reason: "done".into(),
        };
        self.sink.send(Message::Close(Some(frame))).await?;
        Ok(())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> ChatReceiver<S> {
    /// The next protocol message (pings and pongs are skipped).
    pub async fn recv(&mut self) -> Result<Received, ClientError> {
        loop {
            let message = match self.stream.next().await {
                None => return Ok(Received::Closed(None)),
                Some(m) => m?,
            };
            let bytes = match message {
                Message::Binary(b) => b,
                Message::Close(frame) => {
                    return Ok(Received::Closed(
                        frame.map(|f| (u16::from(f.code), f.reason.to_string())),
                    ))
                }
                Message::Text(t) => {
                    return Ok(Received::Other {
                        kind: b'T',
                        len: t.len(),
                    })
                }
                _ => continue,
            };
            let Some((&kind, payload)) = bytes.split_first() else {
                return Ok(Received::Other { kind: 0, len: 0 });
            };
            return Ok(match MessageKind::from_byte(kind) {
                Some(MessageKind::Handshake) => Received::Handshake,
                Some(MessageKind::Audio) => {
                    let mut pcm = Vec::new();
                    self.reader
                        .push(payload, &mut pcm, MAX_SAMPLES_PER_MESSAGE)?;
                    Received::Audio(pcm)
                }
                Some(MessageKind::Text) => {
                    Received::Text(String::from_utf8_lossy(payload).into_owned())
                }
                Some(MessageKind::Metadata) => Received::Metadata(
                    serde_json::from_slice(payload).unwrap_or(serde_json::Value::Null),
                ),
                Some(MessageKind::Error) => {
                    Received::Error(String::from_utf8_lossy(payload).into_owned())
                }
                _ => Received::Other {
                    kind,
                    len: payload.len(),
                },
            });
        }
    }
}

//! The protobuf codec of the generated services and clients: prost's, except that a message
//! that does not decode is `INVALID_ARGUMENT` (the peer sent it malformed) instead of
//! tonic-prost's `INTERNAL`. The status message keeps prost's wording, which names the field
//! (`failed to decode Protobuf message: DecideRequest.path: invalid wire type ...`).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf};
use tonic_prost::{ProstCodec, ProstEncoder};

/// [`ProstCodec`] with decode errors reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(ProstCodec::default())
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(PhantomData)
    }
}

/// Decodes `U`; a malformed message is `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct Decoder<U>(PhantomData<U>);

impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // prost's message: "failed to decode Protobuf message: Msg.field: reason".
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

//! Container Storage Interface v1.12.0, generated from `proto/csi.proto`.
//!
//! The protocol definition is vendored unchanged from the CSI specification
//! repository; its license is in `proto/LICENSE`. This crate holds the generated
//! messages, clients (`*_client`) and servers (`*_server`), and the codec they use.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The `csi.v1` protobuf package.
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

pub use v1::*;

/// Bytes of a call's encoding and decoding buffers (tonic's default is 8 KiB).
pub const CODEC_BUFFER: usize = 1024;

/// Bytes encoded before a streaming call yields (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// The codec of every CSI call: prost's encoding, with [`CODEC_BUFFER`]-byte buffers. CSI
/// messages are a few hundred bytes and a buffer grows for a larger one; a provisioner's 100
/// workers have 100 calls in flight, which held 800 KB of buffers at tonic's default.
#[derive(Debug, Clone)]
pub struct CsiCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for CsiCodec<T, U> {
    fn default() -> Self {
        CsiCodec(PhantomData)
    }
}

impl<T, U> Codec for CsiCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(CODEC_BUFFER, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::new(CODEC_BUFFER, YIELD_THRESHOLD))
    }
}

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

impl VolumeCapability {
    /// A filesystem mount in `mode`: of `fs_type` (empty for the driver's default), without
    /// mount flags or a volume mount group.
    pub fn mount(fs_type: &str, mode: volume_capability::access_mode::Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    fs_type: fs_type.to_string(),
                    ..Default::default()
                },
            )),
        }
    }

    /// A raw block device in `mode`.
    pub fn block(mode: volume_capability::access_mode::Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume {},
            )),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::volume_capability::access_mode::Mode;
    use super::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    use super::*;

    #[test]
    fn capabilities_name_their_access_type_and_mode() {
        let mount = VolumeCapability::mount("ext4", Mode::SingleNodeWriter);
        assert_eq!(mount.access_mode, Some(AccessMode { mode: 1 }));
        assert_eq!(
            mount.access_type,
            Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                mount_flags: Vec::new(),
                volume_mount_group: String::new(),
            }))
        );
        let block = VolumeCapability::block(Mode::MultiNodeMultiWriter);
        assert_eq!(block.access_mode, Some(AccessMode { mode: 5 }));
        assert_eq!(block.access_type, Some(AccessType::Block(BlockVolume {})));
    }
}

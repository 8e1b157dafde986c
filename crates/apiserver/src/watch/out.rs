//! A watch stream's output: the events queued for the client go out together, in chunks,
//! within a byte budget.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use bytes::BytesMut;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// The events a watch stream has yet to write: the initial objects and the replayed history,
/// and the changes that queued up for a watcher behind a burst, go out in chunks of at most
/// [`Out::CHUNK`] bytes (one write to the socket instead of one per event); a lone event, or
/// one larger than a chunk, goes alone and without a copy. Chunk boundaries mean nothing to
/// a client: it reads lines (JSON) or length-prefixed frames (protobuf).
///
/// What waits for the client is bounded in bytes ([`Out::BUDGET`]), not only in chunks: a
/// stalled client holds at most that much however the events were grouped.
pub(super) struct Out {
    tx: mpsc::Sender<Sent>,
    /// Bytes the stream may still queue for the client; a chunk's permits go back once the
    /// response body takes it ([`body_of`]).
    budget: Arc<Semaphore>,
    pending: Pending,
    /// When the stream ends: a send still waiting for the client then gives up.
    ends: tokio::time::Instant,
}

/// A chunk on its way to the client, with its share of the stream's byte budget.
pub(super) type Sent = (Bytes, OwnedSemaphorePermit);

enum Pending {
    Nothing,
    One(Bytes),
    Several(BytesMut),
}

/// What became of an event given to [`Out::put`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Put {
    /// It waits with the events before it.
    Queued,
    /// The events before it went out to make room; it waits.
    SentBefore,
    /// The stream is over: the client left, or the event was an ERROR (sent).
    Over,
}

impl Out {
    /// The most bytes of events sent together.
    const CHUNK: usize = 32 * 1024;

    /// The most bytes queued for the client at once (a chunk larger than that is sent alone
    /// once nothing else is queued).
    const BUDGET: usize = 512 * 1024;

    /// Chunks queued at most (lone events of a few hundred bytes each, in a busy stream).
    pub(super) const QUEUED: usize = 256;

    /// Completes once the client's side is gone (the response body dropped).
    pub(super) async fn closed(&self) {
        self.tx.closed().await;
    }

    pub(super) fn new(tx: mpsc::Sender<Sent>, ends: tokio::time::Instant) -> Self {
        Out {
            tx,
            budget: Arc::new(Semaphore::new(Self::BUDGET)),
            pending: Pending::Nothing,
            ends,
        }
    }

    fn len(&self) -> usize {
        match &self.pending {
            Pending::Nothing => 0,
            Pending::One(bytes) => bytes.len(),
            Pending::Several(bytes) => bytes.len(),
        }
    }

    /// Queues an event, first sending those before it when it would not fit in their chunk.
    /// `Err` is an ERROR event that ends the stream: it is sent after what is before it.
    pub(super) async fn put(&mut self, event: Result<Bytes, Bytes>) -> Put {
        let (bytes, last) = match event {
            Ok(bytes) => (bytes, false),
            Err(error_event) => (error_event, true),
        };
        let mut put = Put::Queued;
        if self.len() > 0 && self.len() + bytes.len() > Self::CHUNK {
            if !self.flush().await {
                return Put::Over;
            }
            put = Put::SentBefore;
        }
        self.pending = match std::mem::replace(&mut self.pending, Pending::Nothing) {
            Pending::Nothing => Pending::One(bytes),
            Pending::One(first) => {
                let mut joined = BytesMut::with_capacity(Self::CHUNK);
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&bytes);
                Pending::Several(joined)
            }
            Pending::Several(mut joined) => {
                joined.extend_from_slice(&bytes);
                Pending::Several(joined)
            }
        };
        if last {
            let _ = self.flush().await;
            return Put::Over;
        }
        put
    }

    /// Sends what is queued; false when the client left, or did not take it before the
    /// stream's end.
    pub(super) async fn flush(&mut self) -> bool {
        let chunk = match std::mem::replace(&mut self.pending, Pending::Nothing) {
            Pending::Nothing => return true,
            Pending::One(bytes) => bytes,
            Pending::Several(joined) => joined.freeze(),
        };
        // Fits in u32: at most the budget.
        let share = chunk.len().min(Self::BUDGET) as u32;
        let budget = self.budget.clone();
        let tx = &self.tx;
        let sent = async move {
            let Ok(permit) = budget.acquire_many_owned(share).await else {
                return false;
            };
            tx.send((chunk, permit)).await.is_ok()
        };
        tokio::time::timeout_at(self.ends, sent)
            .await
            .unwrap_or(false)
    }
}

/// The response body of a watch: the chunks as they come, each giving its share of the
/// stream's byte budget back as the body takes it.
pub(super) fn body_of(chunks: mpsc::Receiver<Sent>) -> Body {
    use futures::StreamExt;
    Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(chunks)
            .map(|(chunk, _share)| Ok::<_, Infallible>(chunk)),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::watch::event_line;
    use serde_json::json;

    /// A stream end no test reaches.
    fn far() -> tokio::time::Instant {
        tokio::time::Instant::now() + std::time::Duration::from_secs(3600)
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_the_client_does_not_take_gives_up_at_the_streams_end() {
        let (tx, _rx) = mpsc::channel(Out::QUEUED);
        let ends = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut out = Out::new(tx, ends);
        let chunk = Bytes::from(vec![b'z'; Out::CHUNK]);
        // Fill the budget; the client (the receiver, alive) reads nothing.
        for _ in 0..Out::BUDGET / Out::CHUNK {
            out.pending = Pending::One(chunk.clone());
            assert!(out.flush().await);
        }
        out.pending = Pending::One(chunk);
        // Paused time moves on only while everything waits: the send waits until the end
        // (a send that never gave up would meet this test's own limit instead).
        let limit = std::time::Duration::from_secs(7200);
        let given_up = tokio::time::timeout(limit, out.flush()).await;
        assert_eq!(given_up, Ok(false), "given up at the stream's end");
        assert!(tokio::time::Instant::now() >= ends);
    }

    #[tokio::test]
    async fn events_queued_together_go_out_as_one_chunk_and_a_lone_one_uncopied() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut out = Out::new(tx, far());
        let (a, b) = (
            event_line("ADDED", &json!({"a": 1})),
            event_line("MODIFIED", &json!({"b": 2})),
        );
        assert_eq!(out.put(Ok(a.clone())).await, Put::Queued);
        assert_eq!(out.put(Ok(b.clone())).await, Put::Queued);
        assert!(rx.try_recv().is_err(), "nothing is sent before the flush");
        assert!(out.flush().await);
        let chunk = rx.recv().await.unwrap().0;
        assert_eq!(chunk, [&a[..], &b[..]].concat());
        assert!(out.flush().await, "an empty flush sends nothing");
        assert_eq!(out.put(Ok(a.clone())).await, Put::Queued);
        assert!(out.flush().await);
        let lone = rx.recv().await.unwrap().0;
        assert_eq!(
            lone.as_ptr(),
            a.as_ptr(),
            "a lone event is the shared line itself"
        );
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_chunk_never_grows_past_its_size_and_an_error_event_ends_the_stream() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut out = Out::new(tx, far());
        let big = Bytes::from(vec![b'x'; Out::CHUNK - 10]);
        let (small, more) = (Bytes::from_static(b"0123456789"), Bytes::from_static(b"ab"));
        assert_eq!(out.put(Ok(big.clone())).await, Put::Queued);
        assert_eq!(
            out.put(Ok(small.clone())).await,
            Put::Queued,
            "fits exactly"
        );
        assert_eq!(out.put(Ok(more.clone())).await, Put::SentBefore);
        assert_eq!(rx.recv().await.unwrap().0.len(), Out::CHUNK);
        assert!(out.flush().await);
        assert_eq!(rx.recv().await.unwrap().0, more);
        // Larger than a chunk: alone, uncopied.
        let huge = Bytes::from(vec![b'y'; Out::CHUNK * 2]);
        assert_eq!(out.put(Ok(small.clone())).await, Put::Queued);
        assert_eq!(out.put(Ok(huge.clone())).await, Put::SentBefore);
        assert!(out.flush().await);
        assert_eq!(rx.recv().await.unwrap().0, small);
        assert_eq!(rx.recv().await.unwrap().0.as_ptr(), huge.as_ptr());
        assert_eq!(
            out.put(Ok(Bytes::from_static(b"before\n"))).await,
            Put::Queued
        );
        assert_eq!(
            out.put(Err(Bytes::from_static(b"error\n"))).await,
            Put::Over
        );
        assert_eq!(&rx.recv().await.unwrap().0[..], b"before\nerror\n");
        drop(rx);
        assert_eq!(
            out.put(Ok(big)).await,
            Put::Queued,
            "queued: the client's absence shows at the send"
        );
        assert!(!out.flush().await, "a client that left ends the stream");
    }

    #[tokio::test]
    async fn a_stalled_client_holds_no_more_than_the_byte_budget() {
        use futures::FutureExt;
        let (tx, mut rx) = mpsc::channel(Out::QUEUED);
        let mut out = Out::new(tx, far());
        let chunk = Bytes::from(vec![b'z'; Out::CHUNK]);
        // The client reads nothing: chunks are queued until the budget is spent, then the
        // stream waits (its task stops taking changes).
        let mut queued = 0;
        loop {
            out.pending = Pending::One(chunk.clone());
            match out.flush().now_or_never() {
                Some(sent) => {
                    assert!(sent);
                    queued += chunk.len();
                }
                None => break,
            }
            assert!(queued <= Out::BUDGET, "{queued} bytes queued");
        }
        assert_eq!(queued, Out::BUDGET);
        // The body takes one chunk: its share comes back, one more can go.
        drop(rx.recv().await.unwrap());
        out.pending = Pending::One(chunk.clone());
        assert_eq!(out.flush().now_or_never(), Some(true));
        // A chunk larger than the budget goes alone once the queue is empty.
        while rx.try_recv().is_ok() {}
        out.pending = Pending::One(Bytes::from(vec![b'w'; Out::BUDGET * 2]));
        assert_eq!(out.flush().now_or_never(), Some(true));
        assert_eq!(rx.recv().await.unwrap().0.len(), Out::BUDGET * 2);
    }
}

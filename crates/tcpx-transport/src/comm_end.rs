//! One end of a comm written once for both directions.
//!
//! Where a backend's sending and receiving ends are the same state with the same operations (the
//! direction is fixed when the end is made), it implements [`CommEnd`] and hands the end out as a
//! [`SendComm`] through [`SendingEnd`] or as a [`RecvComm`] through [`ReceivingEnd`], instead of
//! writing both traits' methods twice.

use crate::{Memory, MrId, RecvComm, RequestId, Result, SendComm};

/// A comm end whose direction it knows itself.
pub(crate) trait CommEnd: Send {
    fn reg(&mut self, mem: &Memory) -> Result<MrId>;
    fn dereg(&mut self, mr: MrId) -> Result<()>;
    /// Posts this end's next request (a send or a receive, as the end was made); `None` when the
    /// window is full.
    fn post(&mut self, mr: MrId, offset: usize, len: usize) -> Result<Option<RequestId>>;
    /// `Some(bytes)` once `req` finished: see [`SendComm::test`] and [`RecvComm::test`].
    fn test(&mut self, req: RequestId) -> Result<Option<usize>>;
    /// As [`RecvComm::consume`]; only a receiving end is asked.
    fn consume(&mut self, req: RequestId) -> Result<()>;
    fn peer(&self) -> String;
}

/// The methods of [`SendingEnd`]'s and [`ReceivingEnd`]'s impls that are the same for both: each
/// calls the [`CommEnd`] method of the same purpose; `$post` is the trait's name for posting
/// (`isend` or `irecv`).
macro_rules! end_comm_methods {
    ($post:ident) => {
        fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
            self.0.reg(mem)
        }

        fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
            self.0.dereg(mr)
        }

        fn $post(
            &mut self,
            mr: MrId,
            offset: usize,
            len: usize,
            _tag: u32,
        ) -> Result<Option<RequestId>> {
            self.0.post(mr, offset, len)
        }

        fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
            self.0.test(req)
        }

        fn peer(&self) -> String {
            self.0.peer()
        }
    };
}

/// A [`CommEnd`] made for sending, as a [`SendComm`].
pub(crate) struct SendingEnd<E>(pub(crate) E);

impl<E: CommEnd> SendComm for SendingEnd<E> {
    end_comm_methods!(isend);
}

/// A [`CommEnd`] made for receiving, as a [`RecvComm`].
pub(crate) struct ReceivingEnd<E>(pub(crate) E);

impl<E: CommEnd> RecvComm for ReceivingEnd<E> {
    end_comm_methods!(irecv);

    fn consume(&mut self, req: RequestId) -> Result<()> {
        self.0.consume(req)
    }
}

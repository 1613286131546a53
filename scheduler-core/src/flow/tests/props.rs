//! Property tests of the queues (written next).

//! Registration in the address table, readiness, ownership-aware cleanup, and the v4+ snapshot status, against a
//! real PostgreSQL change DB.
//!
//! Every case needs PostgreSQL (`SIDECAR_TEST_DATABASE_URL`): they are in [`pg`].

mod pg;

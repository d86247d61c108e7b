//! Cleanup end to end: a metrics page with moving watermarks, the sidecar's policy, and the rows left in a real
//! PostgreSQL change log.
//!
//! Every case needs PostgreSQL (`SIDECAR_TEST_DATABASE_URL`): they are in [`pg`].

mod pg;

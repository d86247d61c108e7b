//! Slots in the change DB: the sidecar's schema and its migrations, reservation and subscriber rows of several
//! sidecars, what each purge batch reads of them, and the import of a state file an earlier release left.
//!
//! Every case needs PostgreSQL (`SIDECAR_TEST_DATABASE_URL`): they are in [`pg`].

mod pg;

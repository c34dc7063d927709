"""Dynamic Resource Allocation in the scheduler: CEL device selectors and the claim allocator."""

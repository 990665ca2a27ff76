"""TEST FIXTURES ONLY. Nothing in this package is a product path; production code never imports it."""

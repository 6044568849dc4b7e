"""What the tests share: the machine's servers, and how a test asks for one."""

"""Pure transforms shared by the operands: each takes an object (and the context) and changes it."""

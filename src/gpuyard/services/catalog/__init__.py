"""The catalog: GPU types, node plans, node images and locations that users choose from."""

"""What millm reads and writes as documents: miStudio's steering profiles, clusters and circuits
(schemas, fields, JSON Schemas), probe and vector files, label imports and exports, and how a
document binds to the loaded model. Pure: no state, no HTTP."""

//! Both flavours: (being written).

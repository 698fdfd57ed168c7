// The tests' Status assertions: the expression, the code and the message on failure.
#pragma once

#include <gtest/gtest.h>

#include "mladcp/status.h"

#define MLADCP_ASSERT_OK(expr)                               \
  do {                                                       \
    const ::mladcp::Status s_ = (expr);                      \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.to_string(); \
  } while (0)

#define MLADCP_EXPECT_OK(expr)                               \
  do {                                                       \
    const ::mladcp::Status s_ = (expr);                      \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.to_string(); \
  } while (0)
